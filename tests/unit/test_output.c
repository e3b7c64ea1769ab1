/* test_output.c - unit tests for the output module (being written). */
#include <criterion/criterion.h>

Test(output, placeholder_until_the_module_lands)
{
    cr_assert(1 + 1 == 2);
}
