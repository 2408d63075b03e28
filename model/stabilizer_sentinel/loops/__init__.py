"""The training loops and processes a guard watches, and how it sees their steps without changing them.

``networks``          the user's network found inside its wrappers, or a loop's bare tensors
``optimizer_hooks``   what the guard does in an optimizer's step and state-dict hooks
``step_clock``        steps no optimizer hook announces: those a GradScaler skips, loops updated by hand
``bare_tensors``      loops over bare tensors: ``torch.autograd.backward`` wrapped once per process
``backward_loss``     the loss a backward pass starts from, however the script scaled it
``worker_processes``  child processes that train (Hogwild!, ``multiprocessing``), findings.json from several
``distributed``       DDP: this process's rank, and agreeing on a stop

It stands on capture/'s ``store`` only; integration/, detection/ and recovery/ import it.
"""
