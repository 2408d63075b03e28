"""Following a training job: the monitor's decision after one look at it (and the effects it
returns), and the watch function's decisions on the events of jobs and executions."""
