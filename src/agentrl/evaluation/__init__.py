"""agentrl.evaluation"""
