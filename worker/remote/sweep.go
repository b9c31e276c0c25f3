package remote

// CloseGrids closes every grid whose id match accepts (the grids of a
// coordinator that is gone, say) and returns how many it closed. Their
// in-flight calls fail; their pages are freed.
func (s *Server) CloseGrids(match func(grid string) bool) int {
	s.mu.Lock()
	var gone []*grid
	for id, g := range s.grids {
		if match(id) {
			gone = append(gone, g)
		}
	}
	for _, g := range gone {
		s.forget(g)
	}
	s.mu.Unlock()
	for _, g := range gone {
		if err := g.shut(); err != nil {
			s.log.Warn("close grid", "grid", g.id, "err", err)
		}
	}
	return len(gone)
}
