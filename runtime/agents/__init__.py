"""What an agent is made of, as its author writes it: the agent and its registry, tools, the
LLM interface (a scripted one and an OpenAI-compatible client), policy and reconciliation.
Nothing here touches the database, so ``import runtime`` works before Django's apps are
ready.
"""
