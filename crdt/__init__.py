"""locomesh.crdt"""
