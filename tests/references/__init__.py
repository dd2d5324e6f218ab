"""The independent references several test modules share: numpy implementations written from the papers and the
protocols (``margin``: the margin head and its gradients; ``steps``: which samples a step reads), a torch-free writer
of ``torch.save`` archives (``torch_format``), and the peers' own code as committed fixtures (``peers``: reading
``tests/fixtures/*.npz``, made by ``make_peer_fixtures.py`` under torch; ``ijb_set``: the IJB-format set both
sides evaluate). Nothing here is a test module."""
