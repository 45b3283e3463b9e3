"""agentrl.filtering"""
