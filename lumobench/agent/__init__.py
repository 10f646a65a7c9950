"""Coding-agent runs: Qwen Code on SWE-bench tasks against a serving arm (DESIGN §6, paper §VI, §VII-A)."""
