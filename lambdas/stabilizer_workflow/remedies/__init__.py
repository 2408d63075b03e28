"""What follows a finding: the remediation policies, the remedy table (`ladders`), learning rates
sized from the evidence, relaunches after a hang, the job's own in-job rollbacks, and how a recipe
reads as text. Pure: no AWS call, no clock."""
