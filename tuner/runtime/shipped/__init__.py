"""The runtime every exported kernel package ships: this folder, copied whole as the package's _runtime/.

It needs torch and the NVIDIA driver alone (no PyCUDA, no CUDA toolkit) and imports nothing from `tuner`;
the tuner imports it in place (launcher, dispatch) to run the same launch path it exports. Importing this
folder has no side effect: the export's own __init__.py checks its manifest and re-exports the API.
"""
