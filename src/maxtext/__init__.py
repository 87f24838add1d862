"""MaxText-style GRPO post-training on JAX. Importing the package changes nothing in the process;
the command-line programs apply their XLA settings (maxtext.utils.xla_flags) when they start."""
