"""as_rows, the 2-D view every kernel launches on: a view where one exists, a copy
where none does, decided from the strides so that torch.compile traces it (a failed
`view` raised inside dynamo broke the 1b av_dit compiled with the kernels on an H200:
q and k unbound from one qkv tensor have a gap between their heads)."""

from __future__ import annotations

import torch

from stoker.kernels.dispatch import as_rows, rows_view_exists


def test_rows_are_a_view_where_the_leading_dims_flatten() -> None:
    x = torch.randn(4, 6, 8)
    assert rows_view_exists(x) and as_rows(x).data_ptr() == x.data_ptr()
    assert rows_view_exists(x[:, :1])  # a size-1 dim: any stride
    assert not rows_view_exists(torch.randn(4, 1, 6, 8)[:, :, 1:3])  # rows 16 apart, then 48


def test_heads_unbound_from_qkv_are_copied_once_also_under_compile() -> None:
    q, _, _ = torch.randn(2, 5, 3, 4, 16).unbind(2)
    assert not rows_view_exists(q)
    compiled = torch.compile(lambda t: as_rows(t) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q), q.reshape(-1, 16) * 2)
    torch.testing.assert_close(as_rows(q), q.reshape(-1, 16))
