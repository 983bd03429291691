"""What tests and benchmarks share, below every layer of the package and importing none
of them (rvascend/layering_test.py): the llama.cpp peer set-up built, a process's
memory. A fixture that needs a layer (a model, an engine, a server) lives in that
layer's own testing.py."""
