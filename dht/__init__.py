"""locomesh.dht"""
