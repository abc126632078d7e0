"""Schedule template of 2-D convolutions (NCHW), for the CPU and for CUDA."""

from __future__ import annotations

from wpk.dsl import compute as C
from wpk.dsl.rfactor import rfactor
from wpk.dsl.schedule import Schedule
from wpk.dsl.templates import KnobSpace, Template, _choices
from wpk.kernels.templates.conv_cuda import cuda_preferred_points, schedule_conv_cuda, split_choices


def is_conv_stage(stage) -> bool:
    red = stage.reduce
    return red is not None and len(stage.axes) == 4 and len(red.axes) == 3


class ConvTemplate(Template):
    """2-D convolution in NCHW (axes n, k, y, x; reduction c, r, s).

    CPU: loops n, k.o, y.o, x.o (fused into one parallel loop), c.o, then c.i, r, s
    (unrolled window), then a register tile k.i x y.i x x.i with x.i vectorised;
    with `k_inner` the pixel tiles are outermost and k.o inside them, so one input
    patch (`cache_input=1`) serves every output-channel tile.
    With `fuse_yx` the output pixels y*x form one axis (good for small images and
    1x1 kernels). `cache_input` 1 copies the zero-padded input patch (of each c block,
    or of the pixel tile with `k_inner`) into a local buffer, 2 the whole padded input
    once; both remove the padding test from the inner loop.
    CUDA (`conv_cuda`): blocks over (n, k.o, pixel tiles), threads over pixels and
    `block_k` groups of output channels, a `tile_k` x `tile_x` register tile per thread
    (output channels x pixels), optional shared-memory staging of the input patch and of
    the weights per `tile_c` block of input channels; `fuse_yx` maps the pixels as one
    axis (a 1x1 stride-1 convolution is then a GEMM); `split_c` splits the channels over
    blocks with a second kernel summing the parts."""

    name = "conv2d"

    def _extents(self):
        stage = self.main_stage
        n, k, y, x = (int(a.extent.value) for a in stage.axes)
        c, r, s = (int(a.extent.value) for a in stage.reduce.axes)
        return n, k, y, x, c, r, s

    def space(self) -> KnobSpace:
        n, k, y, x, c, r, s = self._extents()
        if self.target == "cpu":
            lanes = self.limits.vector_lanes
            return KnobSpace(
                tile_k=_choices([1, 2, 4, 8, 16], k),
                fuse_yx=[0, 1],
                tile_x=_choices([lanes // 2, lanes, 2 * lanes], max(y * x, lanes // 2)),
                tile_y=_choices([1, 2, 4], y),
                tile_c=sorted({t for t in (c, 4, 8, 16, 32, 64) if t <= c}, reverse=True),
                cache_input=[0, 1, 2],
                unroll_window=[1, 0],
                k_inner=[0, 1],
            )
        return KnobSpace(
            threads_x=_choices([4, 8, 16, 32], max(x, 4)),
            threads_y=_choices([1, 2, 4, 8, 16], y),
            tile_k=_choices([1, 2, 4, 8, 16], k),
            block_k=_choices([1, 2, 4, 8], k),
            tile_c=sorted({t for t in (c, 1, 2, 4, 8, 16, 32) if t <= c}),
            cache_input=[0, 1],
            cache_weight=[0, 1],
            tile_x=_choices([1, 2, 4, 8], max(1, y * x // 4)),
            fuse_yx=[0, 1],
            split_c=split_choices(c),
        )

    def knob_defaults(self) -> dict:
        """CUDA knobs added with the 2-D register tile and split-C: their defaults give the
        schedule of a config recorded before them."""
        return {"tile_x": 1, "fuse_yx": 0, "split_c": 1} if self.target == "cuda" else {}

    def check_knobs(self, config: dict) -> str | None:
        if self.target != "cuda" or config["split_c"] == 1:
            return None
        c = self._extents()[4]
        if config["tile_c"] > c // config["split_c"]:
            return (f"tile_c={config['tile_c']} exceeds the {c // config['split_c']} channels "
                    f"of one of the split_c={config['split_c']} parts")
        return None

    def transformed(self, config: dict):
        """With `split_c` > 1 (CUDA), the operator whose conv stage sums `split_c` partial
        convolutions over channel slices (`wpk.dsl.rfactor`)."""
        parts = config.get("split_c", 1) if self.target == "cuda" else 1
        if parts == 1:
            return self.op
        stage = self.main_stage
        return rfactor(self.op, stage.name, stage.reduce.axes[0].name, parts)

    def preferred_points(self):
        n, k, y, x, c, r, s = self._extents()
        points = list(self.space().points())
        if self.target == "cpu":
            lanes = self.limits.vector_lanes
            fuse = 1 if x < lanes or r * s == 1 else 0
            points.sort(key=lambda p: (p["k_inner"] != 1, p["cache_input"] != 2,
                                       p["fuse_yx"] != fuse, p["tile_x"] != lanes,
                                       -p["tile_k"], p["tile_y"] != 2,
                                       p["tile_c"] != min(c, 64)))
        else:
            return cuda_preferred_points(self)
        return points

    def _apply(self, sched: Schedule, config: dict) -> None:
        stage = self.main_stage
        s = sched[stage.name]
        n, k, y, x = (a.name for a in stage.axes)
        c, r, w = (a.name for a in stage.reduce.axes)
        inputs = _conv_inputs(stage)
        if self.target == "cpu":
            co, ci = s.split(c, config["tile_c"])
            ko, ki = s.split(k, config["tile_k"])
            if config["fuse_yx"]:
                p = s.fuse(y, x)
                po, pi = s.split(p, config["tile_x"])
                pixels, tile = [n, po], [ki, pi]
            else:
                yo, yi = s.split(y, config["tile_y"])
                xo, xi = s.split(x, config["tile_x"])
                pixels, tile = [n, yo, xo], [ki, yi, xi]
                s.unroll(yi)
            if config["k_inner"]:  # pixel tiles outside: one input patch serves every k tile
                s.reorder(*pixels, ko, co, ci, r, w, *tile)
                fused = pixels[0]
                for nxt in pixels[1:]:
                    fused = s.fuse(fused, nxt)
                s.parallel(fused)
                s.cache_write(ko)
                _register_tile(s, config, ki, tile[-1], r, w)
                if config["cache_input"] and inputs[0] is not None:
                    s.cache_read(inputs[0], "local", fused if config["cache_input"] == 1
                                 else None)
                return
            s.reorder(n, ko, *pixels[1:], co, ci, r, w, *tile)
            outer = [n, ko, *pixels[1:]]
            s.cache_write(outer[-1])
            _register_tile(s, config, ki, tile[-1], r, w)
            if config["cache_input"] and inputs[0] is not None:
                s.cache_read(inputs[0], "local", co if config["cache_input"] == 1 else None)
            fused = outer[0]
            for nxt in outer[1:-1]:
                fused = s.fuse(fused, nxt)
            s.parallel(fused)
            return
        schedule_conv_cuda(sched, stage, config, inputs)


def _register_tile(s, config: dict, ki: str, vector: str, r: str, w: str) -> None:
    """CPU: the k tile unrolled, the innermost pixel loop vectorised and, with
    `unroll_window`, the kernel window unrolled."""
    s.unroll(ki)
    s.vectorize(vector)
    if config["unroll_window"]:
        s.unroll(r)
        s.unroll(w)


def _conv_inputs(stage) -> tuple[str | None, str | None]:
    """(data tensor, weight tensor) of a conv stage: the loads inside its reduction."""
    loads = C.loads(stage.reduce.body)
    data = next((ld.tensor for ld in loads if ld.pad is not None or len(ld.indices) == 4), None)
    weight = next((ld.tensor for ld in loads if ld.tensor != data), None)
    return data, weight
