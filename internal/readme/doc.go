// Package readme holds the tests that keep README.md and the guides under
// docs/ honest. Every Go code block in them compiles as a program of a new
// module that uses this module from a checkout, set up with the commands
// README.md gives a reader. A program followed by an output block prints
// that block; an output block that names an Example matches that
// Example's Output comment. Every Example the docs name exists, every
// relative link resolves, and README.md stays a landing page. It has no
// API.
package readme
