"""Developer tools of the clone, not shipped in the wheel: the models and stand-ins that check the GPU kernels
without a GPU.

* ``tools.traffic``: the bytes each path of a ``gae()`` call moves in device memory, and the tables of the
  README and docs/gpu.md (``python -m tools.traffic --write``, from the clone's root);
* ``tools.group_traffic``: the same for ``group_advantages``' CUDA launches;
* ``tools.ptx``: a PTX reader that runs a kernel's sm_90 PTX on the CPU, block by block, and records every global
  load and store;
* ``tools.driver``: a stand-in CUDA driver below the numba-CUDA backend's launch call;
* ``tools.sass``: a cubin's SASS listed, and the instructions one thread issues counted from its loops;
* ``tools.cuda_catalog``: every numba-CUDA kernel structure worth compiling (the compile and launch tests', and
  docs/gpu.md's registers table);
* ``tools.cost_model``: device time from bytes and SASS instructions, calibrated on the measured H200 table, and
  its tables in docs/gpu.md (``python -m tools.cost_model --write``).

They need the CUDA toolkit wheels (``pip install "numba-cuda[cu12]"``) to compile the kernels (the cost model
triton too), and torch to record the generic path. The tests (``tests/test_traffic.py``,
``tests/test_cost_model.py``, ``tests/test_cuda_driver_path.py``, ``tests/test_cuda_compile.py``,
``tests/test_cuda_launch.py``) and the scripts of ``docs/`` import them from the clone's root; ``gae_xp`` never
does.
"""
