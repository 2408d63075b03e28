"""What a training job left and what it says: the sentinel's files (findings.json, stragglers.json),
one observation of the job, and the verdicts read from them. Pure: it never decides a remedy
(`stabilizer_workflow.remedies`) nor what the execution does next (`stabilizer_workflow.monitoring`)."""
