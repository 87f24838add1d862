"""Agents written against the `openai` client, for rl.agent=PATH.py:NAME (integration/tunix/user_agent.py)."""
