"""What an execution carries: the execution input, the user's job and its knobs, the state payload
that travels through the state machine, and the checks made when the input is read (rule lists,
bounds, AWS limits), plus the JSON Schemas written from them. No AWS call, no decision."""
