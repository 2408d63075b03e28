"""Detection: the checks a guard runs on every step, their statistics, and the hang watchdog.

``sentinel``         ``Sentinel``: the finite check every step, the configured rules at save steps,
                     findings.json, the stop (exit 86)
``health``           the checks behind the verdict, whatever the rule list: finite, learning, diverging
``learning_check``   ``LearningCheck``: NotLearning, Diverging and Plateau from the run's own statistics
``fall_tests``       whether a loss fell: the window and line tests
``loss_statistics``  running statistics of the loss and the learning rate (no torch)
``chance_level``     what the best input-blind prediction scores
``surrogate``        whether the loss is a policy gradient's surrogate, which measures no fit
``watchdog``         a thread that notices a hang or a straggler; ``hang_bounds``, its bounds

It stands on rules/, loops/ and capture/; integration/ imports it, and it imports neither integration/
nor recovery/.
"""
