"""locomesh.training"""
