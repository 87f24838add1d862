"""MaxText's reward functions where MaxText code imports them from (MaxText's
maxtext.trainers.post_train.rl.utils_rl): the word-problem task's own, under MaxText's names.

Each is fn(prompts, completions, tmvp_config, **kwargs) -> one float per completion, `answer` (the
truths) among the keyword arguments of the answer checks, as Tunix calls reward functions (by
keyword); tmvp_config is the config pyconfig.initialize returns, its MaxText view, or the task
section. What each config weight pays is in maxtext.tasks.word_problems.
"""

from maxtext.tasks.word_problems import check_answer, check_numbers, match_format_approximately, match_format_exactly

__all__ = ["check_answer", "check_numbers", "match_format_approximately", "match_format_exactly"]
