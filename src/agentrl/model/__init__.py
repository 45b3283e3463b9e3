"""agentrl.model"""
