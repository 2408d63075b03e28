"""The train Lambda's decisions: the first state from the execution input, checked before anything
launches (access, images, the source archive's entry point), and the next attempt's
CreateTrainingJob request."""
