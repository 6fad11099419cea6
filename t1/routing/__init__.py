"""MoE routing records (R3): the routing block codec and its validation."""
