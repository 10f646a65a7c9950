"""lumobench: the benchmark and agent-workload replay harness for LumoTree, vLLM and SGLang."""

__version__ = "0.1.0"
