-- Take PERMITS of a semaphore for one new grant under lock.sem_layout 1:
-- every grant writes its permits in the hash, as daemons before layout 2
-- did and still read (they count a grant without a field as none). The
-- keys, arguments and answers are sem_acquire.lua's.
local FIELD_FROM = 1
--@include sem_take.lua
