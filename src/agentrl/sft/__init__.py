"""agentrl.sft"""
