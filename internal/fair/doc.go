// Package fair shares a consumer's handlers among keys: the scheduler
// below both natsthrottle and asynqthrottle (each keeps a thin adapter for
// its broker's verbs).
//
// A message of a key asks for a handler (Scheduler.Arrive) and gets a
// Ticket, which is granted a handler when its turn comes (or, when it
// could only wait long, a deferral: the delay after which its key's share
// of the handlers reaches it, for the broker to bring it back once). The
// rules, in order:
//
//  1. Max-min fair shares (water-filling, weighted): a key's share is what
//     it needs, up to its weight's part of what the keys needing less leave
//     over. A key that needs less than its share ("light": its measured
//     demand, the running handlers averaged over about a second, and what
//     it has waiting, are below its share) is served before every key that
//     needs more ("heavy"), so it never waits behind one.
//  2. Among keys of one class, start-time fair queuing (Goyal, Vin and
//     Cheng, "Start-time fair queueing", SIGCOMM 1996): each key has a
//     virtual time that advances by its handler time divided by its weight
//     (charged at the grant with the key's mean handler time, corrected
//     when the handler ends); the key with the smallest virtual time goes
//     first, so the handler starts of keys that stay backlogged follow
//     their weights. A key that becomes active again starts at the
//     scheduler's virtual time, so idleness banks no credit.
//  3. Handlers of equal length finish in lockstep, and a light message that
//     arrives just after a round of starts would wait for the next round.
//     So the heavy keys' grants are paced, at least 0.6 mean handler times
//     divided by the handlers left to them apart, which spreads their
//     handlers' ends over a handler time; while a light key is active, a
//     heavy key takes the last free handler only if another one is
//     expected to end within 1.5 mean handler times divided by the
//     handlers; and a light key's handler that ends is kept for light keys
//     for as long (their next messages come about when their last ones
//     end). None of this idles a handler once the ends are spread. Before
//     any handler has ended (for at most a second) heavy keys leave a
//     quarter of the handlers free: the handler time and the light keys'
//     demand are not known yet.
//
// Replayed in virtual time (sim_test.go: 16 handlers of 300 ms, a flood of
// 3,000 jobs at t=0 beside keys sending steadily), these rules keep the
// light keys' p99 wait under about 60 ms after the first second at 1.00 to
// 1.04 times the handler time, where giving every free handler to the
// key that ran least gives them about 300 ms.
//
// A key can be blocked for a while (its rate or its in-flight limit said
// no): its tickets wait without a grant until then, or, for an in-flight
// limit, until a handler of the key ends. Keys without running or waiting
// messages are dropped after a few seconds. A decision costs O(log active
// keys).
package fair
