"""locomesh.netsim"""
