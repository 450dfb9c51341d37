"""Deployments as the serving frameworks launch them: reading a user's SGLang / vLLM-Ascend launch commands
(`read`). Writing them is npusim.results.launch."""
