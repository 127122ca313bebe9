"""locomesh.cli"""
