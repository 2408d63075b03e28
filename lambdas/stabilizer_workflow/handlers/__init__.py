"""The Lambda entry points: each parses its event, calls one function of the workflow, returns."""
