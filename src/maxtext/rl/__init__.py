"""The RL step's own rules, free of Tunix: what both GRPO learners (integration/tunix) apply to a
step's samples, written once so that they can be read, typed and tested without Tunix."""
