"""The client: one front for notebooks and scripts over AWS or the local engine (``clients``), the
execution input from the command line (``inputs``), a SageMaker SDK job adapted to it (``sdk``),
a job's source directory packed (``sourcedir``, ``ignorefile``), the data channels (``channels``)
and the SNS mailbox (``mailbox``)."""
