"""agentrl.data"""
