package zarr

// reader holds what Read needs for one supported array.
type reader struct{}
