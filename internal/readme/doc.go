// Package readme holds the tests that keep README.md honest: every Go code
// block in it compiles as a program of a new module that uses this module
// from a checkout (what the README's "Using the module from a checkout"
// tells a reader to do), and every Example the README names exists. It
// has no API.
package readme
