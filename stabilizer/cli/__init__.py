"""The ``stabilizer`` command: its arguments and exit statuses (``commands``), and what a person
sees while an execution runs (``progress``)."""
