package spin

// procyield executes the PAUSE instruction n times (n > 0), as the runtime's procyield does: it
// tells the CPU that this is a spin loop, which saves power and frees the core's resources for
// its sibling hyperthread.
func procyield(n uint32)
