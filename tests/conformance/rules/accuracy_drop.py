"""A custom rule written for SageMaker Debugger, in smdebug's style, as Debugger's model-pruning
example configures one (`Rule.custom(..., rule_to_invoke=..., rule_parameters={...})`): it reads
the loss module's inputs at evaluation steps, counts correct predictions, and fires when the
accuracy so far falls more than `threshold` below `previous_accuracy`.

It imports smdebug's names and reads smdebug's private step map, as the example does; stabilizer
binds those names to its own engine.
"""

import numpy as np
from smdebug import modes
from smdebug.rules.rule import Rule


class AccuracyDrop(Rule):
    def __init__(self, base_trial, predictions="CrossEntropyLoss_input_0", labels="CrossEntropyLoss_input_1",
                 previous_accuracy=0.0, threshold=0.05):
        super().__init__(base_trial)
        self.predictions = predictions
        self.labels = labels
        self.previous_accuracy = float(previous_accuracy)
        self.threshold = float(threshold)
        self.right = 0
        self.seen = 0

    def invoke_at_step(self, step):
        mode, mode_step = self.base_trial._global_to_mode[step]
        if mode != modes.EVAL:
            return False
        predicted = self.base_trial.tensor(self.predictions).value(mode_step, mode=modes.EVAL)
        if predicted.ndim > 1:
            predicted = np.argmax(predicted, axis=1)
        truth = self.base_trial.tensor(self.labels).value(mode_step, mode=modes.EVAL)
        self.right += int(np.sum(predicted == truth))
        self.seen += int(truth.shape[0])
        accuracy = self.right / self.seen
        self.logger.info(f"step {step}: accuracy {accuracy:.3f}")
        return self.previous_accuracy - accuracy > self.threshold
