"""Acting and rehearsing: prompt rendering, the batched rollout engine, private rehearsal."""
