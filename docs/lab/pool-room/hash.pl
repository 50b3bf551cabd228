# A hash of N strings of 200 bytes, then M random lookups; prints a checksum.
use strict; use warnings;
my ($n, $m) = @ARGV;
my %h; my $seed = 12345;
sub rnd { $seed = ($seed * 1103515245 + 12345) % 2147483648; return $seed; }
for my $i (0..$n-1) { $h{"key$i"} = sprintf("%08d", $i) x 25; }
my $sum = 0;
for (1..$m) { my $k = rnd() % $n; $sum = ($sum + ord(substr($h{"key$k"}, 7, 1)) * ($k % 97)) % 1000000007; }
print "$sum\n";
