package pagestore

// SetFault makes every operation on a file of persisting store s's data
// directory ask f(op, path) first: an error f returns is the operation's,
// which then does not run (an error-injecting wrapper around the
// store's file operations; see IOError.Op for the names of op). nil
// removes it.
func SetFault(s *Store, f func(op, path string) error) {
	if f == nil {
		s.pers.fault.Store(nil)
		return
	}
	s.pers.fault.Store(&f)
}
