"""Stand-in for torch._inductor: only what the agent touches."""
