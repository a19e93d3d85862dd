"""Rollout actors and learner ranks placed by Ray, on one machine or many (`[train.ray]`, `envace train --ray`).

    driver (this process): the store, state.pt, the schedule of steps and versions (`staleness.AheadPipeline`)
      ├─ actors  (placement group A): each loads the base model, takes published versions from the object
      │          store, pulls chunks of a step's groups from the driver's work queue and returns them
      │          scored (`workers.ActorWorker`, `driver.RemoteActors.play`)
      └─ learner (placement group B): N ranks in one torch.distributed group (gloo on CPUs, NCCL on GPUs),
                 each updating on its share of the groups (`workers.LearnerRank`)

Weights and episodes travel through Ray's object store. Where every learner rank sees the run folder (one
machine, or a filesystem every node mounts), the ranks write `state.pt` (under FSDP each its own shards) and the
checkpoint there themselves; elsewhere rank 0 writes them on its own node and streams them to the driver in
pieces, so no node needs a shared filesystem and the driver never holds either whole.
"""
