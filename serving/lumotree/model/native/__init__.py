"""The hybrid model's native CPU forward: a C implementation (forward.c, built once per machine by
build.py) of tree verification, publication, logits rows and the MTP draft step, driven from
PyTorch tensors through ctypes (model.py)."""
