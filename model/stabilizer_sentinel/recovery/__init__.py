"""Going back to a healthy state: in memory, from a checkpoint, or in the job itself.

``rewind``    ``Rewind``: the last healthy training state kept in memory, persisted when a rule fires
``resume``    the newest checkpoint loaded back into a model and its optimizer
``recovery``  ``Recovery``: in-job roll back to the last healthy state and go on at a probed rate
``ranks``     under DDP, rank 0's rollbacks done by every rank (``Follower``, ``Ranks``)

It stands on loops/ (the optimizer state's keys) and ``job_config``; integration/ imports it.
"""
