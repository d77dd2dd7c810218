"""Runs to compare: real PyTorch runs on any store, each rewound once by a real ``load_checkpoint``.

:func:`rewound_run` trains a tiny model in this process to step ``back_to``,
saves a checkpoint, trains on to ``reached``, flushes, restores the
checkpoint (a rewind: "Resumed from step 20 after reaching 40"), then
trains to ``end`` and finishes (closing the run, or leaving it resumable).
About half a second on a local store.
"""

from __future__ import annotations

from typing import Any

BACK_TO = 20
REACHED = 40
END = 50


def rewound_run(
    store: str,
    project: str,
    name: str,
    lr: float,
    *,
    close: bool = True,
    tunables: dict[str, Any] | None = None,
    end: int = END,
) -> str:
    """A run of ``project`` logging ``train/loss`` and ``acc`` at steps 1..``end``, its id.

    Rewound once (at ``REACHED`` back to ``BACK_TO``) when ``end`` is past ``REACHED``.
    """
    import torch

    import launchhelm.torch as lht

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    tr = lht.init(
        project,
        name=name,
        store=store,
        config={"lr": lr, "model": "linear"},
        tunables=tunables if tunables is not None else {"clip": 1.0},
        flush_interval=3600,
    )
    tr.watch(model, opt)
    while tr.global_step < end:
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        # the attempt a rewind abandons is 10 higher: a comparison that drew it would show it
        doomed = end > REACHED and tr.attempt == 0 and BACK_TO < tr.global_step <= REACHED
        tr.log({"train/loss": loss.item() + lr + (10.0 if doomed else 0.0)})
        tr.log({"acc": tr.global_step / 100})
        if tr.global_step == BACK_TO:
            tr.save_checkpoint()
        if tr.global_step == REACHED and tr.attempt == 0:
            tr.flush()
            tr.load_checkpoint("latest")
    tr.finish(close_run=close)
    return str(tr.id)
