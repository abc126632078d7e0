"""CPU graph pass: run chains of convolutions in the NCHWc blocked layout.

onnxruntime's MLAS convolutions are fastest on blocked activations; this pass
rewrites what can stay blocked, as onnxruntime's NchwcTransformer does, and
puts layout changes only at the boundaries.

Blocked tensors. A tensor of logical shape (N, C, H, W) is stored with shape
(N, ceil(C/b), H, W, b), channel c at [:, c // b, :, :, c % b]; the channels
from C to the next multiple of b ("padding lanes") are zero. b is the host
block (16 floats with AVX-512F, 8 with AVX2: `wpk.kernels.nchwc_format`).

Ops of domain `wpk.nchwc` (every one has attrs `block` = b and `channels` =
the logical channel count of its output):

- ReorderInput(X: NCHW) -> Y blocked. Y = X blocked, padding lanes zero.
- ReorderOutput(X: blocked) -> Y: NCHW with `channels` channels (padding dropped).
  With `channels_last` = 1 both read or write NHWC instead: a Transpose between
  NHWC and NCHW at the layout's edge folds into them (`_transpose`).
- Conv(X, W, B, R?) -> Y blocked, with the ONNX Conv attrs `kernel_shape`,
  `strides`, `pads` (always explicit, 4 values), `dilations`, `group` (the
  logical group count). X is blocked, or NCHW (4-d) for a group-1 conv with
  fewer than b input channels (a network's first layer). W is the logical
  OIHW filter (O, C/group, KH, KW) and B the logical bias (O,) or absent
  (''): constants, packed by the kernels. Input 3, when present, is a blocked
  operand of Y's shape that the node's `epilogue` adds. The epilogue is
  wpk's (`wpk.core.workload`): Y = epilogue(conv(X, W) + B); the pass emits
  only [], [act], [add(3)] and [add(3), act] with act one of relu, clip,
  leaky_relu, tanh, sigmoid, hard_sigmoid (as MLAS computes act(conv + B + R));
  the rest of a fused epilogue (e.g. SiLU) follows as a blocked Elementwise.
  Padding lanes of Y are computed as if the filter and bias had zero entries
  for them: epilogue(0 + R's padding lane).
- MaxPool / AveragePool(X blocked) -> Y blocked: the ONNX pools with
  `kernel_shape`, `strides`, explicit `pads`, `ceil_mode` (+ `count_include_pad`
  for AveragePool), applied to every lane including padding lanes.
- GlobalAveragePool / GlobalMaxPool(X blocked) -> Y blocked (N, Cb, 1, 1, b).
- Upsample(X blocked) -> Y blocked: a Resize over H and W by whole-number
  `scales` (2 ints), `mode` nearest (replication) or linear, with
  `coordinate_transformation_mode` asymmetric, half_pixel or align_corners,
  applied to every lane (`wpk.passes.nchwc_data.upsample_form` says which
  Resize nodes qualify).
- DepthToSpace(X blocked) -> Y NCHW: the ONNX DepthToSpace (`blocksize` r, `mode` DCR or
  CRD) read from the real lanes of X, written as the NCHW tensor of `channels` = C / r^2
  channels (a super-resolution network's PixelShuffle: its conv stays blocked, whatever
  its channel count, and no ReorderOutput runs before the shuffle).
- A Pad of H and W only, with zeros, reflect or edge (each keeps zero padding lanes
  zero) or another finite constant (its result dirty), stays a default-domain Pad on the
  5-d tensor, widths 0 on the lane dim.
- GroupNorm(X blocked, Scale, Bias) -> Y blocked: wpk's GroupNorm
  (`wpk.kernels.cpu.group_norm_spec`, attrs `groups`, `epsilon`) of a blocked 4-d X,
  Scale and Bias logical (C,); the statistics read the real lanes only, Y's padding lanes
  are zero (kept blocked only with an epilogue that maps 0 to 0).
- A Slice that crops H and W only (step 1; Keras' Cropping2D) stays a default-domain
  Slice of the 5-d tensor over axes 2 and 3, its padding lanes as they were.
- ChannelSlice(X blocked) -> Y blocked: `channels` channels from channel
  `start` (a multiple of b), i.e. whole blocks of X: a channel Split or Slice
  on block boundaries, one node per piece.
- ChannelGather(X_0, ..., X_k blocked) -> Y blocked: output channel j is lane
  `indices[j]` of the inputs' padded lanes laid end to end (X_0's Cb_0*b lanes, then
  X_1's, ...); padding lanes zero. What a channel Concat, shuffle and Split of blocked
  tensors compose to (`wpk.passes.nchwc_gather`: a ShuffleNet block's end), and a
  Concat or channel slice of channel counts that are not whole blocks.

Other ops on blocked tensors. An elementwise node or chain (Add, Mul, Relu,
Clip, Sum, ..., `Elementwise`) whose value and tensor operands are all blocked
tensors of one logical shape (operands may also be (N, C, 1, 1), e.g. a
squeeze-excitation gate) becomes a wpk `Elementwise` node (domain 'wpk')
on the 5-d tensors, when every step maps a zero padding lane to zero; a
constant operand that is a scalar or per channel ((C,1,1) or (1,C,1,1))
becomes a (1, Cb, 1, 1, b) constant whose padding lanes are neutral (0 for
add/sub/mul/max/min, 1 for a divisor or exponent). Concat along channels
stays a default-domain Concat on axis 1 of the 5-d tensors when every input's
channel count is a multiple of b. BatchNormalization on a blocked input
becomes a depthwise 1x1 `wpk.nchwc` Conv (per-channel scale and shift). A
Gemm that alone reads the flattened blocked pooled features (N, C, 1, 1)
becomes a blocked 1x1 Conv followed by a ReorderOutput and a Flatten of its
(N, O, 1, 1) result (`wpk.passes.nchwc_classifier`).
Every other consumer, and every graph output, reads the NCHW tensor through
one shared ReorderOutput, which keeps the original tensor name.

Where it pays: convs need a multiple of 4 output channels, or an even count padded by
at most a quarter (ShuffleNet's 58), or at least 8 channels filling half their blocks'
lanes where a conv reads the result (NASNet's 11 and 22), padded to whole blocks
(any output count on a 1x1 output, e.g. a squeeze-excitation conv, where the
padding lanes cost nothing), grouped convs whole blocks per group (narrower groups, as
ResNeXt's 4 channels, merged into one group per input block: `nchwc_rules.widen_groups`,
zeros between a merged group's own groups, onnxruntime's NCHW kernel for them being far
slower than the extra multiply-adds; a partial last block of whole groups first filled
with groups of zero weights and bias, `nchwc_rules.pad_groups`, whose outputs are the
padding lanes: such a Conv's `channels` and filter count those lanes too; a widened
Conv whose groups had as many inputs as outputs carries their width, `group_width`, so a
generated kernel can skip the zeros; groups that are neither, as ShuffleNet's 68 channels,
one dense group, `nchwc_rules.sparse_groups_fit`, carrying their count, `sparse_groups`,
a generated kernel reading each output block's band of input blocks only); graphs with
fewer than `NchwcOptions.min_convs` convertible convs are left alone, unless the one conv
is a ViT's patch embedding (a stem reading the NCHW input, kernel = stride: one reorder,
of its output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.workload import EpilogueStep
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.group_norm_spec import GROUP_NORM_DOMAIN, GROUP_NORM_OP
from wpk.kernels.nchwc_format import CONV_ACTIVATIONS, GROUP_WIDTH, SPARSE_GROUPS
from wpk.passes.base import GraphPass, drop_unused_constants, readers_of, subgraph_names
from wpk.passes.elementwise import chain_start
from wpk.passes.nchwc_classifier import match_classifier
from wpk.passes.nchwc_data import channel_slices, spatial_crop, upsample_form
from wpk.passes.nchwc_gather import (
    GatherViews,
    concat_view,
    shuffle_permutation,
    shuffle_view,
    slice_views,
)
from wpk.passes.nchwc_rewrite import NCHWC_DOMAIN, Blocked, Rewrite
from wpk.passes.nchwc_rules import (
    block_groups,
    conv_bias,
    conv_epilogue_prefix,
    conv_input_mode,
    explicit_pads,
    fused_dirty,
    pad_groups,
    pixel_shuffle_form,
    step_keeps_zero,
    widen_groups,
)
from wpk.passes.pad_form import pad_form


@dataclass(frozen=True)
class NchwcOptions:
    """Options of the NCHWc layout pass (`enabled=False` leaves every graph as it is)."""

    enabled: bool = True
    block: int | None = None   # None: the host's block (16 with AVX-512F, 8 with AVX2)
    min_convs: int = 2         # fewer convertible convs than this: not worth the reorders


def _patch_embedding(graph: Graph, node: Node, mode: str) -> bool:
    """Whether a conv is a ViT's patch embedding (a stem reading the NCHW input as it is,
    its kernel its stride, no padding): alone in its graph it still takes the layout, its
    one reorder that of its output (onnxruntime's plain Conv ran it 1.4x slower)."""
    kernel = tuple(graph.constants[node.inputs[1]].shape[2:])
    return mode == "nchw" and len(kernel) == 2 and min(kernel) > 1 \
        and tuple(node.attr("strides", (1, 1))) == kernel \
        and not any(node.attr("pads", ()) or ()) \
        and str(node.attr("auto_pad", "NOTSET")) in ("NOTSET", "VALID")


class NchwcLayout(GraphPass):
    """Rewrite conv chains to the blocked NCHWc layout (target cpu)."""

    name = "nchwc_layout"

    def __init__(self, options: NchwcOptions | None = None) -> None:
        super().__init__()
        self.options = options or NchwcOptions()

    def run(self, graph: Graph) -> Graph:
        if not self.options.enabled:
            return graph
        block = self.options.block or fmt.host_block_size()
        convs = [(n, m) for n in graph.nodes if (m := conv_input_mode(graph, n, block, set()))]
        if len(convs) < self.options.min_convs and not (len(convs) == 1
                                                        and _patch_embedding(graph, *convs[0])):
            return graph
        rw = Rewrite(graph, block)
        self._readers = _reader_counts(graph)
        self._reader_nodes = readers_of(graph)
        self._absorbed: set[int] = set()   # ids of nodes rewritten along with an earlier one
        self._views = GatherViews({})
        outer_scope = subgraph_names(graph)  # read by If/Loop bodies, not listed as inputs
        for node in graph.nodes:
            if not self._convert(rw, node):
                node.inputs = [rw.as_nchw(i) if i else i for i in node.inputs]
                if outer_scope and _has_subgraph(node):
                    for name in outer_scope:
                        self._views.write(rw, name)
                        rw.as_nchw(name)
                rw.nodes.append(node)
        for name in graph.outputs:
            self._views.write(rw, name)
            rw.as_nchw(name)
        graph.nodes = rw.nodes
        _forget_unused_tensors(graph)
        drop_unused_constants(graph)
        return graph

    # --- one method per rewritten op family -------------------------------------------------

    def _convert(self, rw: Rewrite, node: Node) -> bool:
        if id(node) in self._absorbed:
            return True
        if self._channel_view(rw, node):
            return True
        self._views.write_inputs(rw, node)
        if node.op in ("Split", "Slice"):
            return self._channel_slices(rw, node) or self._spatial_slice(rw, node)
        if node.domain not in ("", "ai.onnx", "wpk") or len(node.outputs) != 1:
            return False
        op = node.op
        if op in ("Flatten", "Reshape"):
            return self._classifier(rw, node)
        if op == "Conv":
            return self._conv(rw, node)
        if op in ("MaxPool", "AveragePool"):
            return self._pool(rw, node)
        if op in ("GlobalAveragePool", "GlobalMaxPool"):
            return self._global_pool(rw, node)
        if op == "BatchNormalization":
            return self._batch_norm(rw, node)
        if op == "Concat":
            return self._concat(rw, node)
        if op == "Resize":
            return self._upsample(rw, node)
        if op == "DepthToSpace":
            return self._depth_to_space(rw, node)
        if op == "Pad":
            return self._pad(rw, node)
        if op == "Transpose":
            return self._transpose(rw, node)
        if op == GROUP_NORM_OP and node.domain == GROUP_NORM_DOMAIN:
            return self._group_norm(rw, node)
        return self._elementwise(rw, node)

    def _channel_view(self, rw: Rewrite, node: Node) -> bool:
        """A channel Concat, shuffle or split of blocked tensors deferred as a view, written
        by ChannelGather nodes when read (`nchwc_gather`)."""
        if node.op == "Concat":
            readers = self._reader_nodes.get(node.outputs[0], [])
            shuffled = bool(readers) and node.outputs[0] not in rw.graph.outputs and all(
                shuffle_permutation(rw.graph, r, self._reader_nodes) for r in readers)
            found = concat_view(rw, self._views, node, shuffled)
        elif node.op == "Reshape":
            form = shuffle_permutation(rw.graph, node, self._reader_nodes)
            found = form is not None and shuffle_view(rw, self._views, form, node)
            if found:
                self._absorbed.update(id(n) for n in form.absorbed)
        elif node.op in ("Split", "Slice"):
            found = slice_views(rw, self._views, node)
        else:
            return False
        if found:
            self.hit(f"{node.op} as a channel view")
        return found

    def _conv(self, rw: Rewrite, node: Node) -> bool:
        g = rw.graph
        mode = conv_input_mode(g, node, rw.block, set(rw.blocked))
        if not mode:
            return False
        weight = g.constants[node.inputs[1]]
        channels = int(weight.shape[0])
        group = int(node.attr("group", 1))
        fused = conv_epilogue_prefix(g, node, channels, rw.block)
        rest = [(s, None if s.operand is None else node.inputs[s.operand])
                for s in node.epilogue[fused:]]
        out_shape = rw.shape(node.outputs[0])
        residual = node.epilogue[0] if fused and node.epilogue[0].op == "add" else None
        dirty = fused_dirty(node.epilogue[:fused], residual is not None
                            and rw.is_dirty(node.inputs[residual.operand]))
        if rest and not rw.chain_is_blockable(rest, channels, out_shape, dirty):
            return False
        x = node.inputs[0]
        x_in = rw.as_nchw(x) if mode == "nchw" else rw.as_blocked(x)
        w_name, b_name, conv_channels = node.inputs[1], conv_bias(g, node), channels
        width = sparse = 0   # narrow groups' width, in as out; sparse groups' count
        if group > 1 and weight.shape[1] > 1:   # a grouped conv: groups of whole blocks
            merged = block_groups(weight.shape[1] * group, channels, group, rw.block)
            if not merged:   # groups that are not whole blocks: one dense group
                sparse = group
                w_name = self._constant(rw, f"{node.name}_dense_groups",
                                        widen_groups(weight, group, 1))
                group = 1
                self.hit("grouped Conv as one sparse group")
            elif merged != group:
                bias = g.constants[b_name] if b_name else None
                if weight.shape[0] == weight.shape[1] * group:
                    width = int(weight.shape[1])
                weight, bias, group = pad_groups(weight, bias, group, rw.block)
                conv_channels = int(weight.shape[0])   # its padding lanes' zero groups too
                w_name = self._constant(rw, f"{node.name}_wide_groups",
                                        widen_groups(weight, group, merged))
                if bias is not None and conv_channels != channels:
                    b_name = self._constant(rw, f"{node.name}_padded_bias", bias)
                group = merged
                self.hit("grouped Conv widened to whole blocks")
        inputs = [x_in, w_name, b_name]
        epilogue = list(node.epilogue[:fused])
        if epilogue and epilogue[0].op == "add":
            inputs.append(rw.as_blocked(node.inputs[epilogue[0].operand]))
            epilogue[0] = EpilogueStep("add", epilogue[0].attrs, 3, False)
        attrs = {
            "kernel_shape": tuple(int(k) for k in weight.shape[2:]),
            "strides": tuple(node.attr("strides", (1, 1))),
            "pads": explicit_pads(node, self._in_hw(rw, x), out_shape[2:], weight.shape[2:]),
            "dilations": tuple(node.attr("dilations", (1, 1))),
            "group": group,
            "block": rw.block,
            "channels": conv_channels,
        }
        if width:   # generated kernels skip the zeros (`micro.nchwc`'s narrow groups)
            attrs[GROUP_WIDTH] = width
        if sparse:  # ... and the input blocks outside a tile's groups
            attrs[SPARSE_GROUPS] = sparse
        out = rw.new_blocked(node.outputs[0], channels, dirty=dirty and not rest)
        conv_out = rw.blocked_tensor(f"{out}_conv", out_shape, channels) if rest else out
        rw.nodes.append(Node("Conv", inputs, [conv_out], node.name, attrs, NCHWC_DOMAIN,
                             tuple(epilogue)))
        if rest:  # what the Conv cannot carry runs as a blocked Elementwise right after
            rw.emit_chain(rw.fresh(f"{node.name}_epilogue"), conv_out, rest, channels, out)
        self.hit("Conv")
        return True

    @staticmethod
    def _constant(rw: Rewrite, base: str, value: np.ndarray) -> str:
        name = rw.fresh(base)
        rw.graph.constants[name] = value
        rw.graph.tensors[name] = TensorInfo(tuple(value.shape), value.dtype.name)
        return name

    def _group_norm(self, rw: Rewrite, node: Node) -> bool:
        """wpk's GroupNorm of a blocked 4-d tensor stays blocked: its statistics skip the
        input's padding lanes, its output's are zero (an epilogue that keeps 0 at 0)."""
        x = node.inputs[0]
        if x not in rw.blocked or len(rw.shape(x)) != 4 \
                or not all(step_keeps_zero(step, None) for step in node.epilogue):
            return False
        channels = rw.shape(x)[1]
        attrs = {"groups": int(node.attr("groups")), "epsilon": float(node.attr("epsilon")),
                 "block": rw.block, "channels": channels}
        out = rw.new_blocked(node.outputs[0], channels)
        rw.nodes.append(Node(GROUP_NORM_OP, [rw.as_blocked(x), *node.inputs[1:3]], [out],
                             node.name, attrs, NCHWC_DOMAIN, tuple(node.epilogue)))
        self.hit("GroupNorm")
        return True

    def _pool(self, rw: Rewrite, node: Node) -> bool:
        x = node.inputs[0]
        shape = rw.shape(x)
        if len(shape) != 4 or node.epilogue or rw.graph.tensors[x].dtype != "float32":
            return False
        if x not in rw.blocked and shape[1] % rw.block:
            return False
        if any(int(d) != 1 for d in node.attr("dilations", (1, 1))) \
                or int(node.attr("storage_order", 0)) != 0:
            return False
        kernel = tuple(int(k) for k in node.attr("kernel_shape"))
        attrs = {"kernel_shape": kernel, "strides": tuple(node.attr("strides", (1, 1))),
                 "pads": explicit_pads(node, shape[2:], self._out_hw(rw, node), kernel),
                 "ceil_mode": int(node.attr("ceil_mode", 0)),
                 "block": rw.block, "channels": shape[1]}
        if node.op == "AveragePool":
            attrs["count_include_pad"] = int(node.attr("count_include_pad", 0))
        x_in = rw.as_blocked(x)
        out = rw.new_blocked(node.outputs[0], shape[1], dirty=rw.is_dirty(x))
        rw.nodes.append(Node(node.op, [x_in], [out], node.name, attrs, NCHWC_DOMAIN))
        self.hit(node.op)
        return True

    def _global_pool(self, rw: Rewrite, node: Node) -> bool:
        x = node.inputs[0]
        if x not in rw.blocked or node.epilogue:
            return False
        channels = rw.blocked[x].channels
        out = rw.new_blocked(node.outputs[0], channels, dirty=rw.is_dirty(x))
        rw.nodes.append(Node(node.op, [rw.blocked[x].name], [out], node.name,
                             {"block": rw.block, "channels": channels}, NCHWC_DOMAIN))
        self.hit(node.op)
        return True

    def _batch_norm(self, rw: Rewrite, node: Node) -> bool:
        g = rw.graph
        x = node.inputs[0]
        if x not in rw.blocked or len(node.inputs) < 5 or node.epilogue \
                or not all(i in g.constants for i in node.inputs[1:5]):
            return False
        scale, shift, mean, var = (np.asarray(g.constants[i], np.float64)
                                   for i in node.inputs[1:5])
        gain = scale / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
        channels = rw.blocked[x].channels
        w_name = rw.fresh(f"{node.name}_scale")
        b_name = rw.fresh(f"{node.name}_shift")
        g.constants[w_name] = gain.astype(np.float32).reshape(channels, 1, 1, 1)
        g.constants[b_name] = (shift - mean * gain).astype(np.float32)
        g.tensors[w_name] = TensorInfo((channels, 1, 1, 1), "float32")
        g.tensors[b_name] = TensorInfo((channels,), "float32")
        attrs = {"kernel_shape": (1, 1), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "dilations": (1, 1), "group": channels, "block": rw.block,
                 "channels": channels}
        x_in = rw.blocked[x].name
        out = rw.new_blocked(node.outputs[0], channels)
        rw.nodes.append(Node("Conv", [x_in, w_name, b_name], [out], node.name, attrs,
                             NCHWC_DOMAIN))
        self.hit("BatchNormalization")
        return True

    def _concat(self, rw: Rewrite, node: Node) -> bool:
        axis = int(node.attr("axis", 1))
        ins = node.inputs
        if axis not in (1, -3) or not ins or not all(i in rw.blocked for i in ins):
            return False
        if any(rw.blocked[i].channels % rw.block for i in ins):
            return False
        channels = sum(rw.blocked[i].channels for i in ins)
        out = rw.new_blocked(node.outputs[0], channels)
        rw.nodes.append(Node("Concat", [rw.blocked[i].name for i in ins], [out], node.name,
                             {"axis": 1}, node.domain))
        self.hit("Concat")
        return True

    def _upsample(self, rw: Rewrite, node: Node) -> bool:
        x = node.inputs[0]
        form = upsample_form(rw.graph, node) if x in rw.blocked and not node.epilogue else None
        if form is None:
            return False
        entry = rw.blocked[x]
        out = rw.new_blocked(node.outputs[0], entry.channels, dirty=entry.dirty)
        attrs = {"scales": form.scales, "mode": form.mode,
                 "coordinate_transformation_mode": form.transform,
                 "block": rw.block, "channels": entry.channels}
        rw.nodes.append(Node("Upsample", [entry.name], [out], node.name, attrs, NCHWC_DOMAIN))
        self.hit("Upsample")
        return True

    def _depth_to_space(self, rw: Rewrite, node: Node) -> bool:
        """A DepthToSpace of a blocked tensor reads its blocks directly and writes the NCHW
        result (`pixel_shuffle_form` says which qualify)."""
        x = node.inputs[0]
        mode = pixel_shuffle_form(rw.graph, node)
        if x not in rw.blocked or not mode:
            return False
        entry = rw.blocked[x]
        attrs = {"blocksize": int(node.attr("blocksize")), "mode": mode, "block": rw.block,
                 "channels": rw.shape(node.outputs[0])[1]}
        rw.nodes.append(Node("DepthToSpace", [entry.name], [node.outputs[0]], node.name, attrs,
                             NCHWC_DOMAIN))
        self.hit("DepthToSpace")
        return True

    def _pad(self, rw: Rewrite, node: Node) -> bool:
        """A Pad of H and W pads (or, constant, crops: negative widths) the blocked tensor's
        H and W: a default-domain Pad on the 5-d tensor. Zero, reflect and edge keep zero
        padding lanes zero; another (finite) constant writes it into the padding lanes of
        the new border, so the result is dirty (convs never read those lanes; see
        nchwc_rewrite). Zero channels pad whole blocks (`_channel_blocks`)."""
        x = node.inputs[0]
        form = pad_form(rw.graph, node) if x in rw.blocked and not node.epilogue else None
        if form is None or len(form.begin) != 4 or form.begin[0] or form.end[0] \
                or form.mode not in ("constant", "reflect", "edge") \
                or (form.mode == "constant" and not math.isfinite(form.value)) \
                or (min(form.begin + form.end) < 0 and form.mode != "constant"):
            return False
        entry = rw.blocked[x]
        blocks = self._channel_blocks(rw, entry, form)
        if blocks is None:
            return False
        dirty = entry.dirty or (form.mode == "constant" and form.value != 0)
        channels = entry.channels + form.begin[1] + form.end[1]
        out = rw.new_blocked(node.outputs[0], channels, dirty=dirty)
        widths = (0, blocks[0], *form.begin[2:], 0, 0, blocks[1], *form.end[2:], 0)
        inputs, attrs = [entry.name], {"mode": form.mode}
        if rw.graph.opset < 11:
            attrs["pads"] = widths
            if form.value:
                attrs["value"] = float(form.value)
        else:
            name = rw.fresh(f"{node.name}_pads_nchwc")
            rw.graph.constants[name] = np.array(widths, np.int64)
            rw.graph.tensors[name] = TensorInfo((len(widths),), "int64")
            inputs.append(name)
            if form.value:
                value = rw.fresh(f"{node.name}_value_nchwc")
                rw.graph.constants[value] = np.array(form.value, np.float32)
                rw.graph.tensors[value] = TensorInfo((), "float32")
                inputs.append(value)
        rw.nodes.append(Node("Pad", inputs, [out], node.name, attrs, node.domain))
        self.hit("Pad")
        return True

    @staticmethod
    def _channel_blocks(rw: Rewrite, entry, form) -> tuple[int, int] | None:
        """(blocks before, blocks after) a Pad adds on the blocked tensor's block axis, or
        None when it cannot: channel widths must be zeros added to a clean tensor (its zero
        padding lanes become the new channels of its last block), none removed, those
        before whole blocks (a CIFAR ResNet's shortcut pads 8 channels on each side: whole
        blocks of 8 on an AVX2 host, half a block of 16 on an AVX-512 one)."""
        before, after = form.begin[1], form.end[1]
        if not before and not after:
            return 0, 0
        if min(before, after) < 0 or form.mode != "constant" or form.value != 0 \
                or entry.dirty or before % rw.block:
            return None
        old = -(-entry.channels // rw.block)
        return before // rw.block, -(-(entry.channels + after) // rw.block) - old

    def _transpose(self, rw: Rewrite, node: Node) -> bool:
        """NCHW <-> NHWC transposes at the blocked layout's edge become its reorders with
        `channels_last` (one pass instead of a reorder and a transpose): a blocked tensor
        transposed to NHWC is a ReorderOutput to NHWC; an NHWC tensor transposed to NCHW
        for a reader that can take it blocked (a conv or an elementwise step, e.g. a
        ConvNeXt block's residual add) is a ReorderInput from NHWC."""
        x, out = node.inputs[0], node.outputs[0]
        perm = tuple(int(p) for p in node.attr("perm", ()))
        if node.epilogue or len(rw.shape(x)) != 4 or rw.graph.tensors[x].dtype != "float32":
            return False
        if perm == TO_NHWC and x in rw.blocked and not rw.is_dirty(x):
            entry = rw.blocked[x]
            rw.nodes.append(Node("ReorderOutput", [entry.name], [out], node.name,
                                 {"block": rw.block, "channels": entry.channels,
                                  "channels_last": 1}, NCHWC_DOMAIN))
            self.hit("Transpose")
            return True
        channels = rw.shape(x)[3]
        if perm != TO_NCHW or channels % 4 or not self._blocked_reader(out):
            return False
        blocked = rw.new_blocked(out, channels)
        rw.nodes.append(Node("ReorderInput", [x], [blocked], node.name,
                             {"block": rw.block, "channels": channels, "channels_last": 1},
                             NCHWC_DOMAIN))
        self.hit("Transpose")
        return True

    def _blocked_reader(self, name: str) -> bool:
        """Whether some reader of `name` may take it blocked: a conv, or an elementwise
        step (it is blocked when its value is)."""
        return any(reader.op == "Conv" or (reader.domain in ("", "ai.onnx", "wpk") and
                                            reader.op in BLOCKABLE_READERS)
                   for reader in self._reader_nodes.get(name, ()))

    def _channel_slices(self, rw: Rewrite, node: Node) -> bool:
        """A block-aligned channel Split/Slice of a blocked tensor: one ChannelSlice per
        piece, each whole blocks of the input (`nchwc_data.channel_slices`)."""
        x = node.inputs[0]
        pieces = channel_slices(rw.graph, node, rw.block) if x in rw.blocked else None
        if pieces is None or node.epilogue:
            return False
        entry = rw.blocked[x]
        for index, ((start, count), name) in enumerate(zip(pieces, node.outputs)):
            if not name:
                continue
            tail = start + count == entry.channels
            out = rw.new_blocked(name, count, dirty=entry.dirty and tail)
            attrs = {"start": start, "block": rw.block, "channels": count}
            rw.nodes.append(Node("ChannelSlice", [entry.name], [out],
                                 node.name if len(pieces) == 1 else f"{node.name}/{index}",
                                 attrs, NCHWC_DOMAIN))
        self.hit(node.op)
        return True

    def _spatial_slice(self, rw: Rewrite, node: Node) -> bool:
        """A crop of H and W (a Slice of step 1 along them, Keras' Cropping2D) of a blocked
        tensor: the same Slice of the 5-d tensor, its padding lanes as they were."""
        x = node.inputs[0]
        crop = spatial_crop(rw.graph, node) if x in rw.blocked and not node.epilogue \
            else None
        if crop is None:
            return False
        entry = rw.blocked[x]
        out = rw.new_blocked(node.outputs[0], entry.channels, dirty=entry.dirty)
        params = {"starts": crop[0], "ends": crop[1], "axes": (2, 3)}
        inputs, attrs = [entry.name], {}
        if rw.graph.opset < 10:
            attrs = params
        else:
            for key, value in params.items():
                inputs.append(self._constant(rw, f"{node.name}_{key}_nchwc",
                                             np.array(value, np.int64)))
        rw.nodes.append(Node("Slice", inputs, [out], node.name, attrs, node.domain))
        self.hit("Slice")
        return True

    def _elementwise(self, rw: Rewrite, node: Node) -> bool:
        g = rw.graph
        if node.op == "Sum" and node.domain in ("", "ai.onnx") and len(node.inputs) > 1:
            start = (node.inputs[0], [(EpilogueStep("add"), i) for i in node.inputs[1:]])
        else:
            start = chain_start(g, node)
        if start is None or start[0] not in rw.blocked or len(node.outputs) != 1:
            return False
        value, chain = start
        out_shape = rw.shape(node.outputs[0])
        if rw.shape(value) != out_shape or g.tensors[node.outputs[0]].dtype != "float32":
            return False
        channels = rw.blocked[value].channels
        if self._fuse_activation(rw, value, chain, node.outputs[0]):
            return True
        dirty = False
        if not rw.chain_is_blockable(chain, channels, out_shape, rw.is_dirty(value)):
            if not rw.chain_may_dirty(chain):
                return False
            dirty = True
        out = rw.new_blocked(node.outputs[0], channels, dirty=dirty)
        rw.emit_chain(node.name, rw.blocked[value].name, chain, channels, out)
        self.hit("elementwise")
        return True

    def _classifier(self, rw: Rewrite, node: Node) -> bool:
        """Flatten/Reshape of blocked pooled features -> Gemm: a blocked 1x1 Conv, then the
        layout change and the Flatten on its (N, O, 1, 1) output (`nchwc_classifier`)."""
        x = node.inputs[0]
        if x not in rw.blocked or rw.blocked[x].channels % 4:
            return False
        found = match_classifier(rw.graph, node, self._reader_nodes.get(node.outputs[0], []))
        if found is None:
            return False
        g, gemm, out = rw.graph, found.gemm, found.gemm.outputs[0]
        outputs = int(found.weight.shape[0])
        names = []
        for suffix, value in (("W", found.weight), ("B", found.bias)):
            names.append(rw.fresh(f"{gemm.name}_{suffix}"))
            g.constants[names[-1]] = value
            g.tensors[names[-1]] = TensorInfo(tuple(value.shape), "float32")
        logical = rw.fresh(f"{out}_pixels")
        g.tensors[logical] = TensorInfo((g.tensors[out].shape[0], outputs, 1, 1), "float32")
        attrs = {"kernel_shape": (1, 1), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "dilations": (1, 1), "group": 1, "block": rw.block, "channels": outputs}
        rw.nodes.append(Node("Conv", [rw.blocked[x].name, *names],
                             [rw.new_blocked(logical, outputs)], gemm.name, attrs,
                             NCHWC_DOMAIN))
        rw.nodes.append(Node("Flatten", [rw.as_nchw(logical)], [out], node.name, {"axis": 1}))
        self._absorbed.add(id(gemm))
        self.hit("classifier")
        return True

    def _fuse_activation(self, rw: Rewrite, value: str, chain, output: str) -> bool:
        """Fold a lone activation into the blocked Conv that alone feeds it (as MLAS does,
        e.g. the ReLU after a BatchNormalization turned depthwise Conv; SiLU and HardSwish
        too, `CONV_ACTIVATIONS`)."""
        if len(chain) != 1 or chain[0][1] is not None or self._readers.get(value, 0) != 1:
            return False
        step = chain[0][0]
        producer = _producer(rw.nodes, rw.blocked[value].name)
        if producer is None or producer.domain != NCHWC_DOMAIN or producer.op != "Conv" \
                or any(s.op != "add" for s in producer.epilogue):
            return False
        if step.op not in CONV_ACTIVATIONS:
            return False
        producer.epilogue = (*producer.epilogue, step)
        entry = rw.blocked[value]
        dirty = entry.dirty or fused_dirty([step])
        rw.blocked[output] = Blocked(entry.name, entry.channels,
                                     dirty and entry.channels % rw.block != 0)
        rw.missing.add(output)
        self.hit("activation_into_conv")
        return True

    @staticmethod
    def _in_hw(rw: Rewrite, name: str) -> tuple[int, int]:
        return tuple(rw.shape(name)[2:4])

    @staticmethod
    def _out_hw(rw: Rewrite, node: Node) -> tuple[int, int]:
        return tuple(rw.shape(node.outputs[0])[2:4])


TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
BLOCKABLE_READERS = frozenset({"Add", "Sum", "Mul", "Sub", "Elementwise", "Relu", "Clip"})


def _has_subgraph(node: Node) -> bool:
    return any(hasattr(sub, "node") for value in node.attrs.values()
               for sub in (value if isinstance(value, tuple) else (value,)))


def _reader_counts(graph: Graph) -> dict[str, int]:
    """How many node inputs read each tensor (graph outputs count as one more)."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        for name in node.inputs:
            counts[name] = counts.get(name, 0) + 1
    for name in graph.outputs:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _producer(nodes: list[Node], name: str) -> Node | None:
    return next((n for n in reversed(nodes) if name in n.outputs), None)


def _forget_unused_tensors(graph: Graph) -> None:
    used = set(graph.inputs) | set(graph.outputs) | set(graph.constants)
    for node in graph.nodes:
        used.update(node.inputs)
        used.update(node.outputs)
    for name in [n for n in graph.tensors if n not in used]:
        del graph.tensors[name]


__all__ = ["NCHWC_DOMAIN", "NchwcLayout", "NchwcOptions"]
