"""locomesh.node"""
