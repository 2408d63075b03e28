"""Capture and store: the tensors a job saves, where they live, and how they are read back.

``capture``             ``Capture``: which collections are due at a step; copies tensors to the store and to memory
``collection_config``   the ``capture`` configuration: collections, schedules, modes (pure Python)
``collection_members``  which tensors a collection holds, by name
``module_hooks``        forward hooks on chosen modules, kept outside them
``loss_module``         the loop's ``torch.nn`` loss module, found at its first call
``store``               the tensor store's layout: the writer, local and ``s3://`` readers
``trial``               the Trial API: ``create_trial(path)``, ``MemoryTrial``
``profiler``            system profiling in the job: CPU, memory, IO wait, GPU

The bottom of the library's subpackages: it imports none of them.
"""
