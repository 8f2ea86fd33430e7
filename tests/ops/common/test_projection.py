"""The linear maps across the channels-first layout boundary (ops/common/projection.py) that the
Hyena and Mamba layers use: nn.Linear's results and gradients, each gradient in its input's layout."""

import pytest
import torch
import torch.nn.functional as F

from genoflash.ops.common.projection import project_from_channels_first, project_to_channels_first


@pytest.mark.parametrize("batch", [1, 3])
def test_projections_are_linear_layers_with_gradients_in_each_input_layout(batch):
    torch.manual_seed(0)
    u, w_in = torch.randn(batch, 11, 5, dtype=torch.float64, requires_grad=True), torch.randn(7, 5, dtype=torch.float64,
                                                                                              requires_grad=True)
    w_out, b_out = (torch.randn(4, 7, dtype=torch.float64, requires_grad=True),
                    torch.randn(4, dtype=torch.float64, requires_grad=True))
    z = project_to_channels_first(u, w_in)
    assert z.shape == (batch, 7, 11) and z.is_contiguous()
    y = project_from_channels_first(z, w_out, b_out)
    assert y.shape == (batch, 11, 4) and y.is_contiguous()
    ref = F.linear(F.linear(u, w_in), w_out, b_out)
    torch.testing.assert_close(y, ref)
    dy = torch.randn_like(ref)
    grads = torch.autograd.grad(y, (u, w_in, w_out, b_out), dy)
    for g, r in zip(grads, torch.autograd.grad(ref, (u, w_in, w_out, b_out), dy)):
        torch.testing.assert_close(g, r)
    assert grads[0].is_contiguous()  # u's gradient in u's layout, not a transposed view
    dz = torch.autograd.grad(project_from_channels_first(z.detach().requires_grad_(), w_out, None), w_out, dy)
    assert dz[0].shape == w_out.shape
