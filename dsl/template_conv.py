"""Schedule template of 2-D convolutions (NCHW), for the CPU and for CUDA."""

from __future__ import annotations

from wpk.dsl.schedule import Schedule
from wpk.dsl.templates import KnobSpace, Template, _choices


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
    CUDA: blocks over (n, k.o, y.o, x.o), threads over (y.i, x.i), a `tile_k`
    register tile per thread, optional shared-memory staging of the input patch
    and of the weights per `tile_c` block of input channels."""

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
        )

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
            points.sort(key=lambda p: (p["threads_x"] * p["threads_y"] not in (64, 128, 256),
                                       p["tile_k"] != 4, p["cache_input"], p["cache_weight"]))
        return points

    def _apply(self, sched: Schedule, config: dict) -> None:
        stage = self.main_stage
        s = sched[stage.name]
        n, k, y, x = (a.name for a in stage.axes)
        c, r, w = (a.name for a in stage.reduce.axes)
        inputs = _conv_inputs(stage)
        co, ci = s.split(c, config["tile_c"])
        if self.target == "cpu":
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
                s.unroll(ki)
                s.vectorize(tile[-1])
                if config["unroll_window"]:
                    s.unroll(r)
                    s.unroll(w)
                if config["cache_input"] and inputs[0] is not None:
                    s.cache_read(inputs[0], "local", fused if config["cache_input"] == 1
                                 else None)
                return
            s.reorder(n, ko, *pixels[1:], co, ci, r, w, *tile)
            outer = [n, ko, *pixels[1:]]
            s.cache_write(outer[-1])
            s.unroll(ki)
            s.vectorize(tile[-1])
            if config["unroll_window"]:
                s.unroll(r)
                s.unroll(w)
            if config["cache_input"] and inputs[0] is not None:
                s.cache_read(inputs[0], "local", co if config["cache_input"] == 1 else None)
            fused = outer[0]
            for nxt in outer[1:-1]:
                fused = s.fuse(fused, nxt)
            s.parallel(fused)
            return
        ko, kt = s.split(k, config["tile_k"] * config["block_k"])
        kb, ki = s.split(kt, config["tile_k"])
        yo, yi = s.split(y, config["threads_y"])
        xo, xi = s.split(x, config["threads_x"])
        s.reorder(n, ko, yo, xo, kb, yi, xi, co, ci, r, w, ki)
        blocks = s.fuse(s.fuse(s.fuse(n, ko), yo), xo)
        s.bind(blocks, "blockIdx.x")
        s.bind(kb, "threadIdx.z")
        s.bind(yi, "threadIdx.y")
        s.bind(xi, "threadIdx.x")
        s.cache_write(xi)
        s.unroll(ki)
        if config["cache_input"] and inputs[0] is not None:
            s.cache_read(inputs[0], "shared", co)
        if config["cache_weight"] and inputs[1] is not None:
            s.cache_read(inputs[1], "shared", co)


def _conv_inputs(stage) -> tuple[str | None, str | None]:
    """(data tensor, weight tensor) of a conv stage: the loads inside its reduction."""
    from wpk.dsl import compute as C

    loads = C.loads(stage.reduce.body)
    data = next((ld.tensor for ld in loads if ld.pad is not None or len(ld.indices) == 4), None)
    weight = next((ld.tensor for ld in loads if ld.tensor != data), None)
    return data, weight
