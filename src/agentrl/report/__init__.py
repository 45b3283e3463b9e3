"""agentrl.report"""
