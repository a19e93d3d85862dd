"""The controlled study: does role-wise GRPO teach the policy, beyond what SFT showed it and beyond noise?

    for each seed s (its own SFT: what a seed changes includes the SFT):
        sft          SFT on the recipe's sft.tasks train tasks; the checkpoint records their scenarios
        eval-sft     every test turn of [rollout], greedy, the real environment answering
        wm-sft       the world-model benchmark on the test gold calls
        screen-sft   GRPO's pool (the turns of pool_tasks train tasks SFT never saw) × G, sampled as GRPO samples
        pool         the screen's units whose rewards differ, at most pool_max (`screen.py`)
        for each arm a (envace, caller_only, real_env, fidelity, control at lr = 1e-12, random):
            a          GRPO from sft on the pool (random: sft plus a random update of envace's size,
                       `random_update.py`)
            eval-a, wm-a, screen-a   as for sft; the screen with the same seed, so its episodes pair with sft's
        memory (an arm with an SFT of its own, `config.SFT_ARMS`; not a default arm):
            sft-nN-memory   the seed's SFT again, the same N tasks, with memory-aware rows ([train.sft] memory
                            = [study] memory_sft: caller turns whose prompt carries a rehearsal memory)
            eval-, wm-sft-nN-memory   as for sft; then memory (GRPO from it as envace, on the seed's pool), and
                            its eval, wm and screen as for any arm
        private      (private_seeds) sft and envace with N imagined attempts, N = private_budgets × modes;
                     private-memory the same for memory's own SFT and its GRPO checkpoint
    report       report.md and figure.html in the study's run: every comparison paired, intervals resampled by
                 task, p-values Holm-adjusted over each table's family (`report.py`)

    envace study experiments/study_cpu.toml          # a re-run goes on where the last one stopped
    envace study experiments/study_cpu.toml --so-far # the tables over the stages completed so far
"""

from envace.study.run import report_so_far, study_job

__all__ = ["report_so_far", "study_job"]
