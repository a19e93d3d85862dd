"""Rollout actors and learner ranks placed by Ray, on one machine or many (`[train.ray]`, `envace train --ray`).

    driver (this process): the store, state.pt, and the one scheduler of chunks, steps and versions
                           (`scheduler.Scheduler`, run by `dispatch.Dispatcher` on a thread beside the learner)
      ├─ actors  (placement group A): each loads the base model, takes published versions from the object
      │          store, plays the chunks the scheduler hands it (several at once, `ray.in_flight`) and returns
      │          them scored (`workers.ActorWorker`, `driver.RayWorkers`)
      └─ learner (placement group B): N ranks in one torch.distributed group (gloo on CPUs, NCCL on GPUs),
                 each updating on its share of the groups (`workers.LearnerRank`)

Weights and episodes travel through Ray's object store. Where every learner rank sees the run folder (one
machine, or a filesystem every node mounts), the ranks write `state.pt` (under FSDP each its own shards) and the
checkpoint there themselves; elsewhere rank 0 writes them on its own node and streams them to the driver in
pieces, so no node needs a shared filesystem; the driver then holds a few pieces at a time (one coming back,
at most `driver.SENT_AHEAD` on their way to the ranks when a run resumes).
"""
